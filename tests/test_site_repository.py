"""A site's `repository:` (batch, sagemaker, eks) is an image name in Docker's reference grammar
(jobgen/inputs/image_ref.py), refused in one line naming the file and the key otherwise; the site
schema carries the same pattern, declared once."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jsonschema
import pytest
import yaml

from jobgen.inputs import image_ref, json_schema
from jobgen.inputs import site as sites
from jobgen.inputs.yaml12 import loads
from jobgen.plumbing.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"

HOSTILE = [
    "jobgen; touch x", "$(reboot)/jobgen", "`id`/jobgen", "jobgen\nFROM scratch", "jobgen ",
    " jobgen", "jobgen|tee", "jobgen&&x", "a//b", "jobgen/", "/jobgen", "-jobgen", "jobgen-",
    "jobgen/../etc", "jobgen/.hidden", "job..gen", "ex ample.com/jobgen", "host:port/jobgen",
    "http://registry.example.com/jobgen", "jöbgen", "jobgen\x00x", "", "Jobgen",
    "registry.example.com/Team/jobgen", "jobgen:latest", f"{ECR}/jobgen:v1",
    "jobgen@sha256:" + "0" * 64, "a" * 256, "jobgen'", 'jobgen"', "*", "~user/jobgen",
]
VALID = [
    "jobgen", "team/jobgen", "localhost/jobgen", "localhost:5000/jobgen",
    "registry.example.com/team/jobgen-images", "Registry.Example.com:443/a/b", "[::1]:5000/a",
    "a__b/c.d/e_f/g--h", f"{ECR}/jobgen", "a" * 255,
]


def _site_file(tmp_path: Path, section: str, repository: str) -> Path:
    data = loads((ROOT / "env" / "sites" / "local.yaml").read_text())
    data[section] = {"repository": repository}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("section", ["batch", "sagemaker", "eks"])
@pytest.mark.parametrize("value", HOSTILE)
def test_a_repository_outside_dockers_grammar_is_refused_on_every_backend(
        tmp_path: Path, section: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        sites.load(str(_site_file(tmp_path, section, value)))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'site.yaml'}: {section}.repository: "), message
    assert "\n" not in message
    assert image_ref.problem(value) is not None


@pytest.mark.parametrize("value", VALID)
def test_image_names_in_dockers_grammar_are_taken(tmp_path: Path, value: str) -> None:
    assert image_ref.problem(value) is None
    for section in ("batch", "eks"):
        site: Any = sites.load(str(_site_file(tmp_path, section, value)))
        assert getattr(site, section).repository == value
    # SageMaker pulls from Amazon ECR only: a valid name elsewhere is refused for that.
    if not value.startswith(ECR):
        with pytest.raises(ConfigError, match="not an Amazon ECR repository"):
            sites.load(str(_site_file(tmp_path, "sagemaker", value)))


def test_the_refusal_says_what_to_write() -> None:
    assert "has a tag" in str(image_ref.problem(f"{ECR}/jobgen:v1"))
    assert "has a digest" in str(image_ref.problem("jobgen@sha256:" + "0" * 64))
    assert "upper-case" in str(image_ref.problem("registry.example.com/Jobgen"))
    assert "255" in str(image_ref.problem("a" * 256))


def test_the_site_schema_carries_the_one_pattern() -> None:
    """The schema's pattern is image_ref's (limits.py passes it on), and it refuses and takes
    the same values as the loader."""
    schema = json_schema.site_schema()
    for section in ("batch", "sagemaker", "eks"):
        branch = schema["properties"][section]["anyOf"][0]["properties"]["repository"]
        rule = branch["anyOf"][0]
        assert (rule["pattern"], rule["maxLength"]) == (image_ref.REPOSITORY_PATTERN,
                                                         image_ref.NAME_MAX)
    validator = jsonschema.Draft202012Validator(schema)
    base = loads((ROOT / "env" / "sites" / "local.yaml").read_text())
    for value, ok in [*((v, False) for v in HOSTILE), *((v, True) for v in VALID)]:
        errors = list(validator.iter_errors({**base, "eks": {"repository": value}}))
        assert (errors == []) == ok, (value, [e.message for e in errors])


def test_render_refuses_in_one_line_with_exit_2(tmp_path: Path,
                                                jobgen: Callable[..., Any]) -> None:
    site = _site_file(tmp_path, "batch", "jobgen; touch x")
    result = jobgen("render", "bert1.5b", "--backend", "batch", "--site", str(site),
                    "--nodes", "8", "-o", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines == [f"error: {site}: batch.repository: 'jobgen; touch x' is not an image "
                     "repository in Docker's reference grammar: [REGISTRY[:PORT]/]PATH, path "
                     "components of a-z and 0-9 joined by '.', '_', '__' or '-', separated by "
                     "'/'"], result.output
