"""The live dashboard: series storage and downsampling, the run websocket, charts, episodes, compare."""
