"""`python -m crashdrill.drill [options]` — the same as `crashdrill verify`."""

from crashdrill.drill.cli import main

raise SystemExit(main())
