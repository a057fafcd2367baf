// A run's states and their groups, the page's one copy of server/storage/store.py's (served as
// `run_states` by GET /api/record-kinds; tests/unit/test_run_states_js.py holds the two
// equal). queued → starting → running ⇄ restarting → finished | failed | stopped | diverged.

export const LIVE = new Set(["queued", "starting", "running", "restarting"]);
export const ACTIVE = new Set(["starting", "running", "restarting"]);
export const TERMINAL = new Set(["finished", "failed", "stopped", "diverged"]);
export const ALL = [...LIVE, ...TERMINAL];

