"""A small fully connected classifier, shaped like the template's ``SimpleDenseNet``."""

from __future__ import annotations

import torch
from torch import nn


class DenseNet(nn.Module):
    """Three hidden layers with batch norm; flattens its input."""

    def __init__(
        self,
        input_size: int = 64,
        lin1_size: int = 32,
        lin2_size: int = 32,
        lin3_size: int = 32,
        output_size: int = 10,
    ) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(input_size, lin1_size),
            nn.BatchNorm1d(lin1_size),
            nn.ReLU(),
            nn.Linear(lin1_size, lin2_size),
            nn.BatchNorm1d(lin2_size),
            nn.ReLU(),
            nn.Linear(lin2_size, lin3_size),
            nn.BatchNorm1d(lin3_size),
            nn.ReLU(),
            nn.Linear(lin3_size, output_size),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.view(x.size(0), -1))
