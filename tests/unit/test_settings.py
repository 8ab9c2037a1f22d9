"""The settings cascade: defaults -> [tool.sandbox-tools] -> environment -> flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_tools import settings
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.settings import SETTINGS, Settings, load_settings


def project(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(f'[project]\nname = "x"\n\n[tool.sandbox-tools]\n{table}\n')
    return path


def test_defaults_then_the_table_then_the_environment(tmp_path: Path) -> None:
    assert load_settings({}, pyproject=tmp_path / "none.toml") == Settings()
    toml = project(tmp_path, 'offline = true\nengine-concurrency = 8\ndist = "/srv/dist"')
    from_table = load_settings({}, pyproject=toml)
    assert (from_table.offline, from_table.engine_concurrency) == (True, 8)
    assert from_table.dist == Path("/srv/dist")
    environ = {"SANDBOX_TOOLS_ENGINE_CONCURRENCY": "4", "SANDBOX_TOOLS_OFFLINE": "0"}
    both = load_settings(environ, pyproject=toml)
    assert (both.offline, both.engine_concurrency, both.dist) == (False, 4, Path("/srv/dist"))


def test_flags_come_last_and_leave_the_resolved_settings_as_they_were() -> None:
    resolved = load_settings({"SANDBOX_TOOLS_DEBUG": "0"}, pyproject=Path("/nonexistent"))
    flagged = settings.with_flags(resolved, {"debug": True, "offline": None})
    assert (flagged.debug, flagged.offline) == (True, False)  # None: the flag was not given
    assert resolved.debug is False  # a value, not a process-wide override
    with pytest.raises(ValueError, match="no such settings: colour"):
        settings.with_flags(resolved, {"colour": True})


@pytest.mark.parametrize(
    ("table", "environ", "words"),
    [
        ("ofline = true", {}, "unknown key 'ofline'; did you mean 'offline'?"),
        ("engine-concurrency = 0", {}, "[tool.sandbox-tools] engine-concurrency: '0' is not"),
        ("", {"SANDBOX_TOOLS_OFFLINE": "maybe"}, "SANDBOX_TOOLS_OFFLINE: 'maybe' is not a yes/no"),
    ],
)
def test_bad_settings_are_one_sentence_naming_their_source(
    tmp_path: Path, table: str, environ: dict[str, str], words: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(environ, pyproject=project(tmp_path, table))
    assert words in caught.value.message


def test_a_broken_project_file_is_not_ours_to_judge(tmp_path: Path) -> None:
    broken = tmp_path / "pyproject.toml"
    broken.write_text("[project\n")
    assert load_settings({}, pyproject=broken) == Settings()


def test_every_setting_is_documented_in_the_configuration_reference() -> None:
    reference = (Path(__file__).parents[2] / "docs" / "CONFIGURATION.md").read_text()
    for setting in SETTINGS:
        assert f"| `{setting.env}` | `{setting.key}` |" in reference, setting.env
    assert {s.field for s in SETTINGS} == set(Settings.__dataclass_fields__)
    defaults = Settings()
    for setting in SETTINGS:  # one default, stated twice only for the type checker
        assert getattr(defaults, setting.field) == setting.default, setting.key


def test_no_setting_shares_its_variable_with_a_runtime_limit() -> None:
    """A local sandbox's runtime inherits the host's environment: a host setting named as
    a runtime limit (`SANDBOX_TOOLS_BROWSER_CALL_TIMEOUT` is the runtime's) would set
    both with one variable. A new contributor's setting once took such a name."""
    from sandbox_tools import protocol
    from sandbox_tools.settings import SETTINGS

    runtime_names = {
        value
        for name, value in vars(protocol).items()
        if name.endswith("_ENV") and isinstance(value, str)
    }
    assert "SANDBOX_TOOLS_MAX_BROWSER_SESSIONS" in runtime_names
    clashes = [s.key for s in SETTINGS if s.env in runtime_names]
    assert not clashes, f"settings named as runtime variables: {clashes}"
