"""docs/CONFIG.md is generated from the config's field docs and kept current."""
from __future__ import annotations

import dataclasses

from zrl import algorithms
from zrl.config import SECTIONS
from zrl.config_docs import DOC_PATH, render
from zrl.typed_config import field_docs


def test_config_md_is_current():
    assert DOC_PATH.read_text() == render(), "docs/CONFIG.md is stale: run `python -m zrl.config_docs`"


def test_every_key_of_every_section_and_algorithm_is_listed():
    text = DOC_PATH.read_text()
    for name, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f"`{name}.{f.name}`" in text
    for algo in algorithms.names():
        for f in dataclasses.fields(algorithms.config_class(algo)):
            assert f"`algo.{f.name}`" in text


def test_field_docs_are_read_from_the_source():
    docs = field_docs(SECTIONS["learner"])
    assert docs["batch_size"].startswith("B: env columns per training batch")
