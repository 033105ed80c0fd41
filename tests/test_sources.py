"""recipes/SOURCES.md: every recipe's sources are in the project, and its published tables are
consistent with the formula they state."""
from __future__ import annotations

import re
from pathlib import Path

from jobgen.inputs import recipe as recipes

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "recipes" / "SOURCES.md").read_text(encoding="utf-8")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than - and _ dropped."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def test_every_recipe_header_points_to_a_section_that_is_there() -> None:
    """Each recipe cites the sources of its values (its own section, or the one of the recipe
    it was made from); SOURCES.md is checked for the sections it has, not for one per recipe."""
    headings = {anchor(h) for h in re.findall(r"^## (.+)$", SOURCES, re.MULTILINE)}
    for name in recipes.recipe_names():
        path, _ = recipes.locate(name)
        header = "".join(line for line in path.read_text().splitlines(keepends=True)
                         if line.startswith("#")).replace("\n# ", "")
        cited = re.findall(r"recipes/SOURCES\.md#([a-z0-9_-]+)", header)
        assert cited, f"{name}: its header names no section of recipes/SOURCES.md"
        assert set(cited) <= headings, f"{name}: no such section: {sorted(set(cited) - headings)}"


def test_no_shipped_file_cites_a_document_outside_the_project() -> None:
    for path in [*(ROOT / "recipes").glob("*.yaml"), *(ROOT / "env").rglob("*.yaml")]:
        assert "REFERENCE" not in path.read_text(), path


def table_after(title: str) -> list[list[str]]:
    section = SOURCES[SOURCES.index(f"## {title}\n"):]
    section = section[:section.index("\n## ", 1)]
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in section.splitlines()
            if line.startswith("| ") and not line.startswith(("| instances", "| platform"))]


def test_tokens_per_dollar_follow_the_stated_formula() -> None:
    """throughput x 2048 x 3600 / ($7.59 x instances), rounded as published."""
    for title in ("neox20b", "pythia6.9b"):
        rows = table_after(title)
        assert rows, title
        for instances, throughput, per_dollar in rows:
            expected = float(throughput) * 2048 * 3600 / (7.59 * int(instances))
            assert abs(expected - int(per_dollar.replace(",", ""))) <= 1, (title, instances)


def test_scaling_efficiency_follows_per_accelerator_throughput() -> None:
    for title in ("bert1.5b", "bert-large"):
        rows = table_after(title)
        base = float(rows[0][3])
        for _, accelerators, total, per_accelerator, efficiency in rows:
            assert abs(float(total.replace(",", "")) / int(accelerators)
                       - float(per_accelerator)) < 0.01
            assert abs(float(per_accelerator) / base * 100 - float(efficiency.rstrip(" %"))) < 0.1


def test_the_planners_measurements_are_the_published_tables() -> None:
    """recipes/measurements/published.yaml holds the same figures as the tables here, row for
    row (and anchors that exist)."""
    from jobgen.planning import measurements
    headings = {anchor(h) for h in re.findall(r"^## (.+)$", SOURCES, re.MULTILINE)}
    groups = measurements.published().measurements
    assert {g.recipe for g in groups} == {"neox20b", "pythia6.9b", "bert1.5b", "bert-large"}
    for group in groups:
        cited = re.search(r"recipes/SOURCES\.md#([a-z0-9_-]+)", group.source)
        assert cited and cited.group(1) in headings, group.source
        rows = table_after(group.recipe)
        published = {int(r[0]): float(r[1 if len(r) == 3 else 2].replace(",", ""))
                     for r in rows}
        assert {row.nodes: row.samples_per_s for row in group.rows} == published, group.recipe
        for row, table_row in zip(group.rows, rows):
            if row.per_dollar is not None:
                assert row.per_dollar == int(table_row[2].replace(",", ""))
