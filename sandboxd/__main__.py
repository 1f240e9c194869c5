"""`python -m sandboxd`: serve the sandbox daemon (see sandboxd.server for the options)."""

from sandboxd.server import main

if __name__ == "__main__":
    main()
