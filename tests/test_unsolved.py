"""paper_figures.unsolved: exploratory analysis E2's check (a rerun with the logging is the archived run) and its
per-seed description."""

import gzip
import json

import yaml

from paper_figures import unsolved

NAME = "sera_authors-beta-token-mean_n0-16_seed-3"


def write_run(path, records, eval_bytes, gzipped=False):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"seed": 3, "method": {"name": "sera", "naming": 2}}))
    (path / "DONE").write_text("{}\n")
    (path / "eval_step6_heldout.json").write_bytes(eval_bytes)
    text = "".join(json.dumps(r) + "\n" for r in records)
    if gzipped:
        with gzip.open(path / "metrics.jsonl.gz", "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        (path / "metrics.jsonl").write_text(text)


def rerun_records():
    """Steps 0-1 uniform (no history read), steps 2-6 allocated with E2's values."""
    records = [{"step": s, "train/reward": 0.1 * s, "time/step_s": 1.0} for s in range(2)]
    for s, share in zip(range(2, 7), [0.2, 0.4, 0.6, 0.8, 1.0], strict=True):
        records.append(
            {
                "step": s,
                "train/reward": 0.1 * s,
                "alloc/active": 10,
                "time/step_s": 1.0,
                "alloc/unsolved_share": share,
                "alloc/unsolved_active": s,
                "alloc/solved_n_median": 2 * s,
            }
        )
    return records


def archived_from(records):
    """What the archive holds of a run made before the logging: no E2 values, other timings."""
    return [{k: (9.0 if k.startswith("time/") else v) for k, v in r.items() if k not in unsolved.ADDED}
            for r in records]  # fmt: skip


def test_a_rerun_that_matches_its_archived_run_is_described_per_seed(tmp_path, capsys):
    records = rerun_records()
    write_run(tmp_path / "runs" / NAME, records, b'{"n": 4}')
    write_run(tmp_path / "archive" / NAME, archived_from(records), b'{"n": 4}', gzipped=True)
    assert unsolved.main(["--runs", str(tmp_path / "runs"), "--archive", str(tmp_path / "archive")]) == 0
    out = capsys.readouterr().out
    assert "are the archived run's" in out
    # shares 0.2..1.0 over steps 2-6: mean 0.6; spans (2-3), (4-5), (6): 0.3, 0.7, 1.0; unsolved_active 2..6: 4.0
    assert "| 3 | 2-6 | 0.600 | 0.300 | 0.700 | 1.000 | 4.0 / 10.0 | 8 |" in out
    assert "steps 2-3 | steps 4-5 | steps 6-6" in out


def test_a_rerun_whose_records_differ_from_the_archive_is_reported_not_described(tmp_path, capsys):
    records = rerun_records()
    write_run(tmp_path / "runs" / NAME, records, b'{"n": 4}')
    changed = archived_from(records)
    changed[4]["train/reward"] = 0.5
    write_run(tmp_path / "archive" / NAME, changed, b'{"n": 5}', gzipped=True)
    assert unsolved.main(["--runs", str(tmp_path / "runs"), "--archive", str(tmp_path / "archive")]) == 1
    captured = capsys.readouterr()
    assert "eval_step6_heldout.json differs" in captured.err and "step record at step 4 differs" in captured.err
    assert "| 3 |" not in captured.out


def test_a_transcendental_value_may_differ_in_its_last_bits_and_no_more():
    """c(p_hat, n) and Pass@K go through numpy's log1p, expm1 and power, whose kernels depend on the CPU: a rerun on
    another CPU logs them an ulp apart (seed 17 of C5, rerun on an AMD EPYC without AVX-512), which is the same run;
    more than a few ulps, or any other key, is not."""
    record = {"step": 33, "alloc/c_min_phat": 0.4411764705882353, "eval/heldout/pass@1": 0.061767578124999896}
    ulp = {**record, "alloc/c_min_phat": 0.4411764705882352, "eval/heldout/pass@1": 0.06176757812499989}
    assert unsolved.same_record(record, ulp)
    assert not unsolved.same_record(record, {**record, "alloc/c_min_phat": 0.44117647058823})
    assert not unsolved.same_record({**record, "train/loss": 1.0}, {**record, "train/loss": 1.0000000000000002})
