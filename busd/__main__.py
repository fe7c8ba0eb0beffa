"""`python -m busd` runs the command line, same as the `busd` script."""

from busd.cli.main import main

if __name__ == "__main__":
    main()
