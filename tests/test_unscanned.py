"""What a directory run does not rewrite but still mentions torch_xla (rewrite/unscanned.py):
found in launch scripts and configs, never read in data files; the CLI lists it (the migration
report's tests run that)."""

from __future__ import annotations

from tpu_migrate.rewrite import unscanned
from tpu_migrate.rewrite.files import discover


def test_scripts_and_configs_are_read_for_torch_xla_and_data_is_not(tmp_path):
    (tmp_path / "job.sbatch").write_text("#SBATCH -N 2\nsrun python -c 'import torch_xla'\n")
    (tmp_path / "run.sh").write_text("python train.py\n")  # no mention
    (tmp_path / "cfg.json").write_text('{"lr": 1, "device": "xla"}\n')
    (tmp_path / "model.pt").write_bytes(b"torch_xla" * 10)  # not a script or config: not opened
    (tmp_path / "huge.yaml").write_text("PJRT_DEVICE: TPU\n" + "x: 1\n" * (unscanned.MAX_SIZE // 5))
    (tmp_path / "Makefile").write_text("train:\n\tXLA_USE_BF16=1 python train.py\n")
    found = {m.path.rsplit("/", 1)[1]: (m.line, m.text) for m in map(unscanned.first_mention, sorted(
        str(p) for p in tmp_path.iterdir())) if m is not None}
    assert found == {"job.sbatch": (2, "srun python -c 'import torch_xla'"),
                     "cfg.json": (1, '{"lr": 1, "device": "xla"}'),
                     "Makefile": (2, "XLA_USE_BF16=1 python train.py")}


def test_discover_tells_of_the_files_it_does_not_take(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "requirements.txt").write_text("torch_xla\n")
    (tmp_path / "run.sh").write_text("")
    (tmp_path / "skip").mkdir()
    (tmp_path / "skip" / "old.sh").write_text("")
    others = []
    taken = [path for path, _ in discover([str(tmp_path)], [str(tmp_path / "skip")], on_unscanned=others.append)]
    assert sorted(p.rsplit("/", 1)[1] for p in taken) == ["requirements.txt", "train.py"]
    assert [p.rsplit("/", 1)[1] for p in others] == ["run.sh"]  # the excluded one is not told
