"""The batch fields of MTK's state (system level), named once for the integrator
(:mod:`~alchemi_integrators.npt`) and its Warp kernels (:mod:`~alchemi_integrators.mtk_kernels`).

Example:
    >>> from alchemi_integrators.npt_fields import CELL_STRAIN_RATE
    >>> CELL_STRAIN_RATE
    'npt_strain_rate'
"""

#: The cell's strain rate ``[B, 3, 3]`` (1/fs).
CELL_STRAIN_RATE = "npt_strain_rate"
#: The particle thermostat's chain: positions and velocities ``[B, M]``.
THERMOSTAT_POSITIONS = "npt_thermostat_positions"
THERMOSTAT_VELOCITIES = "npt_thermostat_velocities"
#: The barostat's chain: positions and velocities ``[B, M]``.
BAROSTAT_CHAIN_POSITIONS = "npt_barostat_chain_positions"
BAROSTAT_CHAIN_VELOCITIES = "npt_barostat_chain_velocities"
