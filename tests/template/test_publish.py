"""Ready to publish: template.yaml's AWS::ServerlessRepo::Application metadata is what `sam publish` needs,
and every version SpotGuard shows is the one in VERSION (CloudFormation cannot read that file, so the
template's SemanticVersion is a copy this test keeps equal)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from spotguard_cli.emulator.template import REPO, TEMPLATE, load
from spotguard_cli.main import main

VERSION = (REPO / "VERSION").read_text().strip()
# semver.org's own expression
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
MAX_FILE = 5 * 1024 * 1024  # SAR's limit for the license and readme


@pytest.fixture(scope="module")
def app() -> dict:
    return load()["Metadata"]["AWS::ServerlessRepo::Application"]


def test_the_version_is_semantic():
    assert SEMVER.match(VERSION), VERSION


def test_the_application_metadata_has_what_sam_publish_requires(app):
    # Required to create the application (Name, Description, Author) and to make it public (the license
    # and SemanticVersion); the rest is what the brief asks every publish to carry.
    fields = {"Name", "Description", "Author", "SpdxLicenseId", "LicenseUrl", "ReadmeUrl", "Labels"}
    fields |= {"HomePageUrl", "SourceCodeUrl", "SemanticVersion"}
    assert fields <= set(app), fields - set(app)
    assert set(app) <= fields, f"not a field SAR reads: {set(app) - fields}"
    # Plain strings only: SAR takes no intrinsic functions in this key.
    for key, value in app.items():
        values = value if key == "Labels" else [value]
        assert values and all(isinstance(v, str) and v for v in values), (key, value)


def test_the_application_metadata_meets_sars_limits(app):
    assert app["Name"] == "spotguard"
    assert re.fullmatch(r"[a-zA-Z0-9-]{1,140}", app["Name"])
    assert 1 <= len(app["Description"]) <= 256
    assert re.fullmatch(r"[a-z0-9](([a-z0-9]|-(?!-))*[a-z0-9])?", app["Author"]) and len(app["Author"]) <= 127
    assert 1 <= len(app["Labels"]) <= 10 and len(set(app["Labels"])) == len(app["Labels"])
    for label in app["Labels"]:
        assert re.fullmatch(r"[a-zA-Z0-9+\-_:/@]{1,127}", label), label
    for key in ("HomePageUrl", "SourceCodeUrl"):
        assert re.fullmatch(r"https://\S+", app[key]), (key, app[key])


def test_the_template_publishes_the_one_version(app):
    assert app["SemanticVersion"] == VERSION, "bump template.yaml's SemanticVersion with VERSION"


def test_license_and_readme_are_where_the_metadata_points(app):
    assert app["SpdxLicenseId"] == "Apache-2.0"
    license_file = TEMPLATE.parent / app["LicenseUrl"]
    readme = TEMPLATE.parent / app["ReadmeUrl"]
    assert license_file == REPO / "LICENSE" and readme == REPO / "README.md"
    for path in (license_file, readme):
        assert path.is_file() and 0 < path.stat().st_size <= MAX_FILE, path
    text = license_file.read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_both_packages_take_their_version_from_VERSION():
    for folder in (REPO, REPO / "agent"):
        project = tomllib.loads((folder / "pyproject.toml").read_text())
        assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
        assert project["tool"]["setuptools"]["dynamic"]["version"] == {"file": "VERSION"}
    # setuptools reads no file above a project's folder: the agent's VERSION is a link to the root's.
    assert (REPO / "agent" / "VERSION").resolve() == (REPO / "VERSION").resolve()


def test_the_changelog_has_the_version():
    assert f"## [{VERSION}]" in (REPO / "CHANGELOG.md").read_text()


def test_spotguard_version_prints_it(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"spotguard {VERSION}\n"


def test_the_installed_command_prints_it():
    spotguard = Path(sys.executable).with_name("spotguard")
    command = [str(spotguard)] if spotguard.exists() else [sys.executable, "-m", "spotguard_cli.main"]
    out = subprocess.run([*command, "--version"], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == f"spotguard {VERSION}"
