"""The `spotguard` command line: main.py and a module or package per command (explain.py, jobs/, local/,
simulate.py); emulator/ and simulator/ are what `spotguard local` and `spotguard simulate` run;
answers.py is how they all read the jobs function's answers."""
