"""One module per `longca` subcommand; each defines add_parser(subparsers)."""
