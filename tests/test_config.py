"""mxgemm.config: MxConfig.from_dict on what a config.json may hold."""

import re

import pytest

from mxgemm.config import MxConfig


@pytest.mark.parametrize("qc", [None, [1], "mxfp4", 7])
def test_from_dict_of_a_non_object_is_a_value_error(qc):
    with pytest.raises(ValueError, match=re.escape(f"quantization_config is {qc!r}, expected a JSON object")):
        MxConfig.from_dict(qc)
