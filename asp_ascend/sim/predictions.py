"""The simulator's length predictions (``lengths.predictor`` on a workload's history epochs) and how
far they can be trusted, and the split of a workload's epochs into history and simulated ones."""
from __future__ import annotations

import numpy as np
import pandas as pd


class Predictions:
    """Per-prompt predicted lengths from a workload's epochs (cached)."""

    def __init__(self, workload, cfg):
        self.w = workload
        self.cfg = cfg
        self._hist: dict[int, pd.DataFrame] = {}
        self._pred: dict[tuple, object] = {}

    def history(self, epochs) -> pd.DataFrame | None:
        if not epochs:
            return None
        for e in epochs:
            if e not in self._hist:
                self._hist[e] = self.w.to_history([e])
        return pd.concat([self._hist[e] for e in epochs], ignore_index=True)

    def predict(self, hist_epochs: tuple, target_epoch: int) -> np.ndarray:
        L = self.cfg.lengths
        if L.predictor == "oracle":
            return self.w.mean_length[target_epoch].astype(float)
        key = tuple(hist_epochs)
        if key not in self._pred:
            from ..lengths.predictors import predict_lengths

            self._pred[key] = np.minimum(predict_lengths(
                self.history(list(hist_epochs)), self.w.prompt_ids, self.w.prompt_length, L.predictor,
                alpha=L.ema_alpha, q=L.quantile, prior=L.prior,
                default=min(256.0, L.max_response_length)), L.max_response_length)
        return self._pred[key]

    def forecasts(self, hist_epochs: tuple, target_epoch: int):
        """The history's record of how its forecasts came true (``lengths.predictors.ForecastRecord``:
        ``scheduler.membership: auto`` and ``scheduler.gather_top`` draw from it): exact for the oracle,
        None below two history epochs (cached)."""
        from ..lengths.predictors import ForecastRecord, forecast_record

        L = self.cfg.lengths
        if L.predictor == "oracle":
            return ForecastRecord.exact(self.w.mean_length[target_epoch])
        key = ("record",) + tuple(hist_epochs)
        if key not in self._pred:
            self._pred[key] = forecast_record(self.history(list(hist_epochs)), L.predictor, alpha=L.ema_alpha,
                                              q=L.quantile, prior=L.prior)
        return self._pred[key]

    def quality(self, hist_epochs: tuple) -> float | None:
        """How far the predictions can be trusted (``scheduler.membership: auto``): 1 for the oracle,
        else ``lengths.predictors.prediction_quality`` of the history (None below two epochs)."""
        from ..lengths.predictors import prediction_quality

        L = self.cfg.lengths
        if L.predictor == "oracle":
            return 1.0
        return prediction_quality(self.history(list(hist_epochs)), L.predictor, alpha=L.ema_alpha, q=L.quantile,
                                  prior=L.prior)


def epoch_split(workload, sim_epochs: int) -> tuple[list[int], list[int]]:
    """(history epochs, simulated epochs) of the workload."""
    E = workload.epochs
    S = max(1, min(sim_epochs, E))
    return list(range(E - S)), list(range(E - S, E))
