"""The `spotguard` command line: main.py and one module per command; emulator/ and simulator/ are what
`spotguard local` and `spotguard simulate` run."""
