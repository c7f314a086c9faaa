"""Scheduler tunables have the ranges the code can act on: a hostile value is refused by
validation instead of overflowing in a worker (int(bucket_mb * MiB), timedelta(timeout_s))."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from schedulers.registry import params_models

HOSTILE = [
    ("ring", "bucket_mb", 1e305), ("gloo", "first_bucket_mb", 1e305), ("gloo", "timeout_s", 1e300),
    ("ring", "chunk_kb", 2**40), ("mercury", "packet_bytes", 2**40), ("forest", "chunk_numel", 2**40),
    ("ring", "bucket_mb", float("inf")),
]


@pytest.mark.parametrize(("scheduler", "key", "value"), HOSTILE)
def test_hostile_tunables_are_refused(scheduler, key, value):
    with pytest.raises(ValidationError) as e:
        params_models()[scheduler].model_validate({key: value})
    assert e.value.errors()[0]["loc"] == (key,)


def test_paper_defaults_are_within_range():
    for model in params_models().values():
        model.model_validate(model().model_dump())  # the defaults, validated (pydantic skips them)


def test_a_number_set_to_true_or_false_is_refused_naming_it():
    """pydantic would take true as 1; every scheduler's numeric tunable refuses it, and a bool one takes it."""
    numeric = 0
    for model in params_models().values():
        for name, info in model.model_fields.items():
            if info.annotation is bool:
                model.model_validate({name: True})
                continue
            if info.annotation not in (int, float, int | None, float | None):
                continue
            numeric += 1
            with pytest.raises(ValidationError, match="must be a number, not true or false") as e:
                model.model_validate({name: True})
            assert e.value.errors()[0]["loc"] == (name,)
    assert numeric > 20
