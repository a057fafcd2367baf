"""Process control that every layer which starts trainers shares, below all of them: the
lab's workers (workers/) and the drill (drill/) both kill a run's whole process tree
(process_tree.py) and fork trainers from one warm process (forkserver.py).

It imports only the standard library and psutil, never the trainer, the workers or the
server (the import-linter contracts in pyproject.toml say so and CI checks them).
"""
