"""The lab's settings, declared once, in sections: each field's type, default, variable,
flag, allowed values and documentation (server/setting_schema.py says how).

    lab · students · front door · storage · realtime · cluster

`Settings` (server/settings.py) is the flat frozen view of them all (`settings.port`);
the CRASHDRILL_* variables (server/settings_env.py), the `crashdrill serve` flags
(server/serve_cli.py) and the table in docs/server.md (scripts/settings_table.py) are derived
from these declarations. A new setting, or a new executor's options, is one field in one
section.
"""

from __future__ import annotations

from crashdrill.server.settings_sections.cluster import ClusterSection
from crashdrill.server.settings_sections.front_door import FrontDoorSection
from crashdrill.server.settings_sections.lab import LabSection
from crashdrill.server.settings_sections.realtime import RealtimeSection
from crashdrill.server.settings_sections.storage import StorageSection
from crashdrill.server.settings_sections.students import StudentsSection

# In the order docs/server.md lists them.
SECTIONS = (
    LabSection,
    StudentsSection,
    FrontDoorSection,
    StorageSection,
    RealtimeSection,
    ClusterSection,
)
