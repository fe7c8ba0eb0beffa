"""What a busd process does as an operating-system process, below every other layer: the
memory it gives back (memory.py) and the processes it starts, which end with it
(children.py)."""
