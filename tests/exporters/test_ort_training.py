"""`exporters.ort_training.OrtTrainer`: a trainer without the eval graph."""

from __future__ import annotations

import numpy as np
import pytest

from exporters.ort_training import OrtTrainer
from exporters.userinput import InputError
from exporters.zoo import get_model
from tests.conftest import SharedArtifacts


def test_a_trainer_without_the_eval_graph_trains_as_one_with_it_and_refuses_eval(
    shared_artifacts: SharedArtifacts,
) -> None:
    model = get_model("fjord-cnn")
    result = shared_artifacts.export(model, model.arch(0.25), batch=4, optimizer="sgd")
    x, y = (t.numpy() for t in model.example_batch(4, seed=1))
    full, lean = OrtTrainer(result.directory, lr=0.05), OrtTrainer(result.directory, lr=0.05, evaluates=False)
    assert [full.train_step(x, y) for _ in range(3)] == [lean.train_step(x, y) for _ in range(3)]
    np.testing.assert_array_equal(full.get_flat(), lean.get_flat())
    assert np.isfinite(full.eval_loss(x, y))
    with pytest.raises(InputError, match="without the eval graph"):
        lean.eval_loss(x, y)
