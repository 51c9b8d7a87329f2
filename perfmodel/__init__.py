"""perfmodel: predict what DDP, FSDP and parameter-server training will do on a GPU cluster.

The predict path (this package) never imports torch; measurement lives in `measure/`.
"""

__version__ = "0.1.0"
