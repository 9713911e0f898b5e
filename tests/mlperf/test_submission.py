"""The results layout and a system description the package's checker accepts."""

from __future__ import annotations

import json

import pytest

from dlrmtrain.mlperf.submission import SubmissionLayout, describe_system, write_system_description


def test_layout_is_mlperfs(tmp_path):
    layout = SubmissionLayout(tmp_path, "cpu2_gloo_codec-dedup", "dlrm_dcnv2")
    assert layout.system_json == tmp_path / "systems" / "cpu2_gloo_codec-dedup.json"
    assert layout.result_file(3) == tmp_path / "results" / "cpu2_gloo_codec-dedup" / "dlrm_dcnv2" / "result_3.txt"


@pytest.mark.parametrize("ruleset", ["2.1.0", "6.0.0"])
def test_system_description_passes_the_system_desc_checker(tmp_path, ruleset):
    layout = SubmissionLayout(tmp_path, "cpu2_gloo_codec-none", "dlrm")
    desc = describe_system(layout.system, submitter="dlrmtrain", division="closed", nodes=1,
                           processes_per_node=2, backend="gloo", codec="none", notes="UNOFFICIAL")
    path = write_system_description(layout, desc, ruleset)
    written = json.loads(path.read_text())
    assert written["system_name"] == "cpu2_gloo_codec-none"
    assert "codec: none" in written["sw_notes"]


def test_incomplete_system_description_is_refused(tmp_path):
    layout = SubmissionLayout(tmp_path, "s", "dlrm")
    with pytest.raises(ValueError, match="system_desc_checker"):
        write_system_description(layout, {"submitter": "x"}, "2.1.0")
