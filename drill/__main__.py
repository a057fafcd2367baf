"""`python -m crashdrill.drill [options]` — the same as `crashdrill verify`."""

from crashdrill.drill.verify_cli import main

raise SystemExit(main())
