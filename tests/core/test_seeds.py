"""The one seed validator (the CLI and the server tests check their ends), and the Python API's use of it."""

import numpy as np
import pytest

from tests.engine.tiny import tiny_llama
from verispec.core.seeds import SEED_LIMIT, check_seed
from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import ConfigError


@pytest.mark.parametrize("value", [0, 1, 2**63 - 1, np.int64(5), np.uint64(2**63 - 1)])
def test_good_seeds_are_kept_exactly(value):
    assert check_seed(value) == int(value) and type(check_seed(value)) is int


@pytest.mark.parametrize("value,fragment", [(-1, "got -1"), (SEED_LIMIT, f"got {SEED_LIMIT}"), (2**70, "got 1180591620717411303424"),
                                            (True, "(bool)"), (1.0, "(float)"), ("7", "(str)"), (None, "(NoneType)")])
def test_bad_seeds_name_the_value_and_the_fix(value, fragment):
    with pytest.raises(ConfigError, match="seed must be an integer in \\[0, 2\\*\\*63\\)") as error:
        check_seed(value)
    assert fragment in str(error.value) and ("pass a" in str(error.value))


def test_check_seed_names_the_caller_field():
    with pytest.raises(ConfigError, match="^--seed must be"):
        check_seed(-3, "--seed")


@pytest.mark.parametrize("seed", [-1, 2**63, 0.5])
def test_python_api_refuses_bad_seeds(seed):
    model = tiny_llama(0, vocab_size=64)
    with pytest.raises(ConfigError, match="seed must be an integer"):
        SpeculativeDecoder(model, "ngram", method="sd", seed=seed)

