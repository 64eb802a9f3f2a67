"""The library's logger. Workers and the CLI attach handlers to it; the library never configures logging."""

import logging

logger = logging.getLogger("training")
