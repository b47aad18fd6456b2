"""``python -m opendit_lite.evaluate``: samples generated on 2 gloo ranks (DiT's sample_ddp .npz) equal
the one-process file; scoring writes metrics.json; torch-fidelity's Inception loads from a local
file; config errors exit with code 2."""

import json
import os

import numpy as np
import pytest
import torch

from tests.distributed import run_distributed
from tests.evaluate.test_metrics import TinyFeatures
from tests.sampling.test_parallel_sampling import image_args


def evaluate_main(argv):
    from opendit_lite.evaluate.__main__ import main

    return main(argv)


def _two_ranks(rank, world_size, argv):
    return evaluate_main(argv)


def test_two_rank_samples_equal_one_process_and_score(tmp_path, monkeypatch, capsys):
    args = image_args(str(tmp_path)) + ["eval.samples_per_class=3", "sample.batch_size=2"]
    evaluate_main(args + [f"eval.output_dir={tmp_path}/one", "eval.save_png=true", "eval.score=false"])
    run_distributed(_two_ranks, 2, args=(args + [f"eval.output_dir={tmp_path}/two", "sp_size=1",
                                                 "eval.score=false"],),
                    env={"OMP_NUM_THREADS": "1"})
    one, two = np.load(tmp_path / "one" / "samples.npz"), np.load(tmp_path / "two" / "samples.npz")
    assert one["arr_0"].shape == (9, 16, 16, 3) and one["arr_0"].dtype == np.uint8
    assert one["labels"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert np.abs(one["arr_0"].astype(int) - two["arr_0"].astype(int)).max() <= 1
    assert sorted(os.listdir(tmp_path / "one" / "samples")) == [f"{i:06d}.png" for i in range(9)]
    assert not (tmp_path / "two" / "parts").exists()

    # Score the 2-rank file against the 1-process one with a tiny extractor in place of Inception.
    import opendit_lite.evaluate.run as run

    fn = TinyFeatures()
    monkeypatch.setattr(run, "load_inception", lambda path, device: fn)
    metrics = evaluate_main(args + [f"eval.samples={tmp_path}/two/samples.npz", f"eval.output_dir={tmp_path}/two",
                                    f"eval.reference={tmp_path}/one/samples.npz", "eval.inception_path=tiny",
                                    "eval.precision_recall=true"])
    assert metrics["fid"] == pytest.approx(0.0, abs=1e-3) and metrics["precision"] == 1.0
    assert json.load(open(tmp_path / "two" / "metrics.json"))["fid"] == metrics["fid"]


def random_inception_file(path, informative: bool = True) -> str:
    """torch-fidelity's InceptionV3 layout with random weights, saved like the real file. The
    default initialisation (BN running variance 0) gives features of ~1e-7 for every image, which
    the loader refuses as wrong content; ``informative`` re-initialises so that images differ."""
    from unittest import mock

    import torch_fidelity.feature_extractor_inceptionv3 as inception

    with mock.patch.object(inception, "load_state_dict_from_url", lambda *a, **k: None), \
            mock.patch.object(inception.FeatureExtractorInceptionV3, "load_state_dict", lambda self, sd: None):
        net = inception.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    if informative:
        gen = torch.Generator().manual_seed(0)
        for m in net.modules():
            if isinstance(m, torch.nn.Conv2d):
                m.weight.data.normal_(0, 1, generator=gen).mul_((2 / m.weight[0].numel()) ** 0.5)  # He init
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_var.fill_(1.0)
    torch.save(net.state_dict(), path)
    return str(path)


def test_inception_from_a_local_file(tmp_path, capsys):
    """torch-fidelity's InceptionV3 loads from the path and gives 2048-d features and 1008 logits
    for uint8 images of any size; a file other than the known one (sha256) is named in a warning."""
    from opendit_lite.evaluate import load_inception

    path = random_inception_file(tmp_path / "weights-inception-2015-12-05-6726825d.pth")
    features, logits = load_inception(path, "cpu")(torch.zeros(1, 3, 8, 8, dtype=torch.uint8))
    assert features.shape == (1, 2048) and logits.shape == (1, 1008)
    assert "is not torch-fidelity's weights-inception-2015-12-05-6726825d.pth (sha256" in capsys.readouterr().err


@pytest.mark.parametrize("override, expected", [
    (["eval.reference=/nonexistent/ref.npz"], "'eval.reference' '/nonexistent/ref.npz' does not exist"),
    (["eval.samples=/nonexistent/s.npz"], "'eval.samples' '/nonexistent/s.npz' does not exist"),
    (["eval.samples_per_class=1"], "'eval.inception_path' is not set"),  # checked before sampling
    (["eval.reference=configs"], "'eval.reference' 'configs' is a folder without images"),
    (["eval.precision_recall=true"], "'eval.precision_recall' compares with reference images"),
])
def test_config_errors_exit_2(override, expected, capsys):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main(["--config", os.path.join(root, "configs/demo.yaml"), *override])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and expected in err and len(err.strip().splitlines()) == 1, err


def test_eval_every_scores_saved_checkpoints_without_changing_training(tmp_path, monkeypatch):
    """train.py with eval_every=2 (ckpt_every=1): metrics of the step-2 and step-4 checkpoints land in
    metrics.jsonl as eval/*, and the loss curve and weights are those of a run without evaluation."""
    import opendit_lite.evaluate.run as run
    import train
    from tests.scripts.test_train_sample import TINY, model_weights

    fn = TinyFeatures()
    monkeypatch.setattr(run, "load_inception", lambda path, device: fn)
    ref = tmp_path / "ref.npz"
    np.savez(ref, arr_0=np.random.default_rng(0).integers(0, 256, (16, 16, 16, 3)).astype(np.uint8))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    common = ["--config", os.path.join(root, "configs/demo.yaml"), f"results_dir={tmp_path}", "max_steps=4",
              "ckpt_every=1", "log_every=1", *TINY, "sample.num_sampling_steps=2"]
    train.main(common + ["exp_name=plain"])
    train.main(common + ["exp_name=evald", "eval_every=2", f"eval.reference={ref}", "eval.inception_path=tiny",
                         "eval.samples_per_class=1"])
    records = {name: [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
               for name in ("plain", "evald")}
    evals = [r for r in records["evald"] if "eval/fid" in r]
    assert [r["step"] for r in evals] == [2, 4] and all(r["eval/fid"] > 0 for r in evals)
    assert (tmp_path / "evald" / "eval" / "step2" / "samples.npz").exists()
    losses = {name: [r["loss"] for r in recs if "loss" in r] for name, recs in records.items()}
    assert losses["evald"] == losses["plain"]
    want, got = (model_weights(tmp_path / name / "checkpoints" / f"{name}_step4") for name in ("plain", "evald"))
    for k in want:
        assert torch.equal(want[k], got[k]), k


def test_eval_every_must_follow_checkpoints(tmp_path):
    import train

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", os.path.join(root, "configs/demo.yaml"), f"results_dir={tmp_path}", "eval_every=3",
                    "ckpt_every=2"])
    assert exit_info.value.code == 2
