"""``memorywalker --help``: every command in one panel by what a person is doing, one line each."""

from __future__ import annotations

from typer.testing import CliRunner

from memorywalker.cli.main import PANELS, app


def test_every_command_is_in_one_panel_with_one_line():
    """The panels name each registered command and group exactly once (a new command not placed fails
    here), and the listing shows them panel by panel in PANELS' order, each on one line at 80 columns."""
    infos = [*app.registered_commands, *app.registered_groups]
    registered = {i.name or i.callback.__name__.replace("_", "-") for i in infos}
    placed = [name for panel in PANELS.values() for name in panel]
    assert sorted(placed) == sorted(registered) and len(placed) == len(set(placed))
    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80", "TERM": "dumb"}).output
    titles = [line.strip("╭─ ").split(" ─")[0] for line in out.splitlines() if line.startswith("╭─ ")]
    assert titles == ["Options", *PANELS]
    rows = out.splitlines()
    for panel in PANELS.values():
        for name, line in panel.items():
            assert any(row.startswith(f"│ {name} ") and line in row for row in rows), (name, line)
