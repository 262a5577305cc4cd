"""The soak suite (a long run with resumes and held batches): a shorter run must stay flat."""

import pytest

from fastpipe.bench import soak


def test_a_short_soak_stays_flat(tmp_path):
    result = soak.soak(str(tmp_path), batches=1_500, hold=0.1, samples=6, seed=1)
    assert result["batches"] == 1_500 and result["epochs"] >= 20 and result["resumes"] >= 20, result
    assert all(result["ok"].values()), result["growth"]
    assert result["samples"][-1]["slots_leased"] == 0


def test_the_epoch_check_catches_a_repeated_or_missing_record():
    import numpy as np

    whole = np.random.default_rng(0).permutation(soak.RECORDS)
    soak.check_epoch([whole[:100], whole[100:]], 0)
    for bad in ([whole[:100], whole[99:]], [whole[:100], whole[101:]]):
        with pytest.raises(AssertionError, match="did not hold every record once"):
            soak.check_epoch(bad, 3)
