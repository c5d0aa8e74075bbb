"""longca: a declarative benchmark for long-context attention."""

__version__ = "0.1.0"
