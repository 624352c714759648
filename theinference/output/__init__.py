"""Everything drawn or written for people and machines: the terminal, the watch screen, JSON,
JUnit, Gradescope. The only layer that imports rich."""
