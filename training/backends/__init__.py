"""Built-in training backends. Each is imported only when first asked for by name."""
