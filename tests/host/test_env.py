"""bench.host.env's small helpers."""

from __future__ import annotations

import pytest

from bench.host.env import version_tuple


@pytest.mark.parametrize(
    "text,parts",
    [
        ("0.19.6+cu130", (0, 19, 6)),
        ("0.19.6", (0, 19, 6)),
        ("2.13.0rc1", (2, 13, 0)),  # a pre-release suffix is not a version part: rc1 is not patch 1
        ("2.13.0a0+git1234", (2, 13, 0)),
        ("0.45.0.dev0", (0, 45, 0)),
        ("1.0.post1", (1, 0)),
        ("2.11", (2, 11)),
        (None, ()),
        ("", ()),
    ],
)
def test_version_tuple(text, parts):
    assert version_tuple(text) == parts
