"""`spotguard local`: the whole system on this machine (see emulator/system.py)."""
