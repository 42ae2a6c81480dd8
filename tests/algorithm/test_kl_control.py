"""The KL coefficient controller against hand-computed numbers."""

import pytest

from coati.algorithm.kl_control import KLController, adaptive_kl_coeff


def test_adaptive_kl_coeff_by_hand():
    # target 6, horizon 10000, 256 samples: kl 9 -> error 0.5 clipped to 0.2: 0.1 * (1 + 0.2 * 0.0256)
    assert adaptive_kl_coeff(0.1, 9.0, 6.0, 10000, 256) == pytest.approx(0.100512)
    # kl 3 -> error -0.5 clipped to -0.2; kl 6.6 -> error 0.1 (inside the clip)
    assert adaptive_kl_coeff(0.1, 3.0, 6.0, 10000, 256) == pytest.approx(0.099488)
    assert adaptive_kl_coeff(0.1, 6.6, 6.0, 10000, 256) == pytest.approx(0.100256)
    assert adaptive_kl_coeff(0.1, 6.0, 6.0, 10000, 256) == pytest.approx(0.1)  # on target: unchanged
    with pytest.raises(ValueError, match="target > 0 and horizon > 0"):
        adaptive_kl_coeff(0.1, 1.0, 0.0, 10000, 1)


def test_controller_fixed_and_adaptive():
    fixed = KLController(0.05)
    assert fixed.update(100.0, 512) == 0.05
    adaptive = KLController(0.1, target=6.0, horizon=10000)
    adaptive.update(9.0, 256)
    adaptive.update(9.0, 256)
    assert adaptive.value == pytest.approx(0.1 * 1.00512 ** 2)
