"""Type stub for the C++ extension zrl._core (csrc/bindings.cc)."""
import numpy as np
import numpy.typing as npt

def vtrace(
    log_rhos: npt.NDArray[np.float32],
    discounts: npt.NDArray[np.float32],
    rewards: npt.NDArray[np.float32],
    values: npt.NDArray[np.float32],
    bootstrap_value: npt.NDArray[np.float32],
    clip_rho_threshold: float,
    clip_pg_rho_threshold: float,
    clip_c_threshold: float,
    lambda_: float,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
