"""`python -m busd` and the `busd` script: the command line (busd.cli).

`busd serve` notes SIGTERM from here on, before the broker is imported
(busd/server/stop_request.py): a stop during start-up then ends it cleanly, exit 0."""

import sys

from busd.server import stop_request


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        stop_request.note_early()
    from busd.cli.main import main as cli

    cli()


if __name__ == "__main__":
    main()
