"""The start-of-run line for bf16 on a CPU that emulates it (dlrmtrain/precision.py):
detected from /proc/cpuinfo's flags, else torch's CPU capability, with the machine's
answers injected; nothing on a CPU with bf16 instructions, a GPU or under fp32."""

from __future__ import annotations

import pytest

from dlrmtrain.precision import cpu_flags, cpu_has_native_bf16, emulated_bf16_note

EPYC_AVX2 = "fpu sse2 avx avx2 fma bmi2 sha_ni".split()  # this machine's kind
SAPPHIRE_RAPIDS = EPYC_AVX2 + "avx512f avx512bw avx512_bf16 amx_bf16 amx_tile".split()


@pytest.fixture
def note(tmp_path):
    """The line on a machine whose /proc/cpuinfo lists `flags` (None: a machine without the file)."""
    def say(flags, capability="AVX2", mode="bf16", device="cpu"):
        cpuinfo = tmp_path / "cpuinfo"
        if flags is not None:
            cpuinfo.write_text("processor\t: 0\nmodel name\t: a CPU\nflags\t\t: " + " ".join(flags) + "\n")
        return emulated_bf16_note(mode, device, str(cpuinfo), capability, slowdown=lambda: 17.2)
    return say


def test_an_avx2_cpu_under_bf16_is_named_with_the_measured_slowdown_and_the_way_out(note):
    line = note(EPYC_AVX2)
    assert line is not None
    assert "without bf16 instructions (AVX2; no avx512_bf16, amx_bf16 or bf16 in /proc/cpuinfo" in line
    assert "~17x slower than fp32" in line and "precision.mode=fp32" in line


@pytest.mark.parametrize("flags", [SAPPHIRE_RAPIDS, EPYC_AVX2 + ["avx512_bf16"], EPYC_AVX2 + ["amx_bf16"],
                                   ["fp", "asimd", "bf16"]])  # the last: an arm64 CPU with bf16
def test_a_cpu_with_bf16_instructions_gets_no_line(note, flags):
    assert note(flags, capability="AVX512") is None


def test_fp32_or_a_gpu_gets_no_line_whatever_the_cpu(note):
    assert note(EPYC_AVX2, mode="fp32") is None
    assert note(EPYC_AVX2, device="cuda") is None


def test_without_cpuinfo_torchs_capability_decides_and_avx512_alone_cannot_tell(note):
    assert cpu_has_native_bf16(None, "AVX2") is False and cpu_has_native_bf16(None, "DEFAULT") is False
    assert cpu_has_native_bf16(None, "AVX512") is None  # avx512 with or without avx512_bf16
    assert note(None, capability="AVX512") is None
    assert "torch's CPU capability AVX2" in note(None, capability="AVX2")


def test_cpu_flags_reads_x86_and_arm64_cpuinfo(tmp_path):
    x86, arm = tmp_path / "x86", tmp_path / "arm"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\n")
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n")
    assert cpu_flags(str(x86)) == {"fpu", "avx2", "fma"}
    assert cpu_has_native_bf16(cpu_flags(str(arm)), "DEFAULT") is True
    assert cpu_flags(str(tmp_path / "absent")) is None


def test_only_rank_0_measures_the_bf16_note_and_the_run_prints_what_it_returns(monkeypatch):
    """train.py prints validation.start_notes: the bf16 line comes from rank 0 only (the rank
    that prints it pays for the matmul it quotes), beside the placement's note."""
    from dlrmtrain import precision, validation
    from dlrmtrain.config.schema import Config

    asked = []  # start_notes imports the note from precision.py when it runs (the CLI's check never does)
    monkeypatch.setattr(precision, "emulated_bf16_note",
                        lambda mode, device: asked.append((mode, device)) or f"note {mode} {device}")
    cfg = Config()
    cfg.precision.mode = "bf16"
    assert validation.start_notes(cfg, cfg, rank=1) == [] and asked == []
    assert validation.start_notes(cfg, cfg, rank=0) == ["note bf16 cpu"]
    assert asked == [("bf16", "cpu")]
