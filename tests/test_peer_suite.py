"""examples/kernelbench.py, the peer-suite runner, on programs written the
way KernelBench writes them (its checkout is not part of this project)."""

from __future__ import annotations

import ast

import pytest

from examples import kernelbench

PROGRAM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.fc = nn.Linear(features, features)

    def forward(self, x, scale):
        return torch.softmax(self.fc(x) * scale, dim=-1)

batch_size = 4096
features = 8192
shape = (batch_size, features)

def get_inputs():
    return [torch.rand(*shape), 0.5]

def get_init_inputs():
    return [features]
"""


def test_sizes_shrink_and_what_derives_from_them_follows():
    source = kernelbench.shrunk_source(PROGRAM, 16)
    namespace: dict = {}
    exec(compile(source, "<test>", "exec"), namespace)
    assert (namespace["batch_size"], namespace["features"]) == (16, 16)
    assert namespace["shape"] == (16, 16)
    # literals inside functions and classes are left alone
    assert ast.dump(ast.parse(source).body[2]) == ast.dump(ast.parse(PROGRAM).body[2])


@pytest.fixture
def suite(tmp_path):
    level = tmp_path / "KernelBench" / "level1"
    level.mkdir(parents=True)
    (level / "1_Linear_Softmax.py").write_text(PROGRAM)
    (level / "2_Loss.py").write_text(
        PROGRAM.replace(
            "torch.softmax(self.fc(x) * scale, dim=-1)",
            "torch.nn.functional.cross_entropy(self.fc(x) * scale, torch.zeros(x.shape[0], dtype=torch.long))",
        )
    )
    (level / "10_Broken.py").write_text("import torch\nclass Model(torch.nn.Module): pass\n")
    return tmp_path


def test_programs_run_and_are_counted(suite, capsys):
    assert [label for _, label in kernelbench.programs(suite, [1])] == [
        "level1/1_Linear_Softmax",
        "level1/2_Loss",
        "level1/10_Broken",
    ]
    assert kernelbench.main([str(suite), "--levels", "1", "--timeout", "120"]) == 0
    out = capsys.readouterr().out
    assert "programs: 3" in out
    counts = {
        line.split()[0]: int(line.split()[-1])
        for line in out.splitlines()
        if line.startswith("  ") and line.split()[-1].isdigit()
    }
    assert counts["verified"] == 2 and counts["not"] == 1 and counts["crashed"] == 0, out


def test_a_missing_checkout_is_one_line(tmp_path, capsys):
    assert kernelbench.main([str(tmp_path / "nowhere")]) == 2
    assert "is not a folder" in capsys.readouterr().err
