"""The kill-and-resume drill (`crashdrill verify`): SIGKILL a training run at seeded random
points, resume it, and compare its trace with an uninterrupted reference bit for bit —
for the built-in trainer and for any training script. See docs/verify.md."""
