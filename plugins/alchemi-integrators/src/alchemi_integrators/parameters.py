"""Per-system integrator parameters: one number, one value per system, or a batch field's name.

Every physical parameter of the integrators in this package (``dt``, ``temperature``,
``friction``, ``tau``, FIRE's ``dt_max``, ``maxstep``, ...) accepts three forms:

* a **scalar** (``temperature=300.0``): every system gets it;
* a **tensor** with one value per system of the batch given to ``run()``
  (``temperature=torch.tensor([100.0, 300.0])``): at the start of the run the values are written
  into a system-level batch field of the stage's own (``stage<code>_<parameter>``), so each value
  stays with its system when systems graduate, leave and the batch is packed. A run fed by a
  sampler (or a downstream pipeline rank) has no such batch; there a tensor is an error that says
  to use a field name instead;
* a **field name** (``temperature="target_temperature"``): each system reads its own value from
  that system-level field (``[B]`` or ``[B, 1]``) every step, so the values travel with each
  system through inflight refills, fused stages and pipelines, and a hook may change them while
  the run goes on (a temperature ramp).

Values are checked when they are given (scalars and tensors) or when the run starts (fields);
the per-step path never reads them back from the device.

Example:
    >>> import torch
    >>> from alchemi_integrators.parameters import SystemParameter
    >>> SystemParameter("temperature", 300.0, unit="K", low=0.0).scalar
    300.0
    >>> SystemParameter("temperature", "target_T", unit="K", low=0.0).field
    'target_T'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import torch

from alchemi_core.errors import ConfigurationError, InvalidDataError

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: What a parameter may be given as.
ParameterValue: TypeAlias = "float | int | torch.Tensor | str"


class SystemParameter:
    """One parameter of an integrator: a scalar, one value per system, or a field name.

    Args:
        name: The parameter's name, used in messages (``"temperature"``).
        value: A number, a 1-D tensor with one value per system, or a field name.
        unit: Its unit, for messages (``"K"``, ``"fs"``, ``"1/fs"``).
        low: Smallest allowed value (None: no bound).
        high: Largest allowed value (None: no bound).
        low_open: Whether ``low`` itself is excluded (``dt > 0`` rather than ``dt >= 0``).

    Raises:
        ConfigurationError: A value outside the allowed range, a tensor that is not 1-D, a
            non-finite value, or a value of another type.
    """

    __slots__ = ("name", "unit", "low", "high", "low_open", "scalar", "tensor", "field", "_bound_field", "_buffer")

    def __init__(
        self,
        name: str,
        value: ParameterValue,
        *,
        unit: str = "",
        low: float | None = None,
        high: float | None = None,
        low_open: bool = False,
    ) -> None:
        self.name = name
        self.unit = unit
        self.low = low
        self.high = high
        self.low_open = low_open
        self.scalar: float | None = None
        self.tensor: torch.Tensor | None = None
        self.field: str | None = None
        self._bound_field: str | None = None
        self._buffer: torch.Tensor | None = None
        if isinstance(value, str):
            if not value:
                raise ConfigurationError(f"{name}: a field name must not be empty")
            self.field = value
        elif isinstance(value, torch.Tensor):
            t = value.detach()
            if t.dim() == 2 and t.shape[1] == 1:
                t = t.reshape(-1)
            if t.dim() != 1:
                raise ConfigurationError(
                    f"{name}: a tensor parameter needs one value per system (shape [B]), got shape "
                    f"{list(value.shape)}; pass a scalar for one value for all systems"
                )
            if t.dtype == torch.bool or t.is_complex():
                raise ConfigurationError(f"{name}: a tensor parameter must hold real numbers, got {t.dtype}")
            self._check(t.double().cpu())  # once, at construction: not on the step path
            self.tensor = t
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            self._check(torch.tensor([float(value)], dtype=torch.float64))
            self.scalar = float(value)
        else:
            raise ConfigurationError(
                f"{name} must be a number, a tensor with one value per system, or the name of a "
                f"system-level batch field; got {type(value).__name__}"
            )

    # ------------------------------------------------------------------ checks
    def _range_text(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"<= {self.high:g}")
        return " and ".join(parts) if parts else "finite"

    def _check(self, values: torch.Tensor, where: str = "") -> None:
        bad = ~torch.isfinite(values)
        if self.low is not None:
            bad |= values <= self.low if self.low_open else values < self.low
        if self.high is not None:
            bad |= values > self.high
        if bool(bad.any()):
            idx = torch.nonzero(bad).flatten()[:5].tolist()
            shown = [float(values[i]) for i in idx]
            unit = f" {self.unit}" if self.unit else ""
            raise ConfigurationError(
                f"{self.name} must be {self._range_text()}{unit}; got {shown}"
                + (f" at systems {idx}" if values.numel() > 1 else "")
                + where
            )

    @property
    def varies(self) -> bool:
        """True when the values can change between steps (read from a user's field)."""
        return self.field is not None

    # ------------------------------------------------------------------ binding to a run
    def bind(self, batch: Batch, own_field: str, *, tensor_allowed: bool, why_not: str = "") -> None:
        """Connect the parameter to the batch of a starting run.

        A tensor is written into the stage's own field ``own_field``; a field name is checked to
        exist at system level and to hold allowed values (the one read-back, at run start).

        Raises:
            ConfigurationError: A tensor whose length differs from the number of systems, a tensor
                where the run has no fixed batch (``why_not`` says why), or a field that is missing,
                not system-level or holds disallowed values.
        """
        from alchemi_core.data.fields import Level

        self._buffer = None
        if self.tensor is not None:
            if not tensor_allowed:
                raise ConfigurationError(
                    f"{self.name} was given as a tensor with one value per system, but {why_not}; "
                    f"put the values in a system-level batch field and pass its name "
                    f"({self.name}=\"my_{self.name}\") so each value travels with its system"
                )
            if self.tensor.numel() != batch.num_graphs:
                raise ConfigurationError(
                    f"{self.name} has {self.tensor.numel()} values but the batch given to run() holds "
                    f"{batch.num_graphs} systems; give one value per system"
                )
            batch.set_field(own_field, self.tensor.to(device=batch.device, dtype=batch.positions.dtype), "system")
            self._bound_field = own_field
        elif self.field is not None:
            if self.field not in batch:
                raise ConfigurationError(
                    f"{self.name} names the batch field {self.field!r}, which the batch does not have; "
                    f"it has {sorted(batch.keys())}. Add it with batch.set_field({self.field!r}, values, "
                    "'system') (one value per system)"
                )
            if batch.level_of(self.field) is not Level.SYSTEM:
                raise ConfigurationError(
                    f"{self.name} names the field {self.field!r}, which is {batch.level_of(self.field).value}-"
                    "level; a parameter field needs one value per system (system level)"
                )
            values = getattr(batch, self.field)
            if values.dim() > 2 or (values.dim() == 2 and values.shape[1] != 1):
                raise ConfigurationError(
                    f"{self.name} names the field {self.field!r} of shape {list(values.shape)}; it needs "
                    "shape [B] or [B, 1]"
                )
            if batch.num_graphs:
                self._check(values.detach().double().reshape(-1).cpu(), f" (field {self.field!r})")
            self._bound_field = self.field

    def per_system(self, batch: Batch, dtype: torch.dtype) -> torch.Tensor:
        """``[B]`` values of a bound tensor or field parameter, in ``dtype`` (no read-back).

        A field of another dtype or shape is copied into a buffer kept between steps, so no
        memory is allocated per step once the batch's composition is fixed.

        Raises:
            InvalidDataError: The field disappeared from the batch during the run.
        """
        name = self._bound_field
        if name is None:
            raise ConfigurationError(f"{self.name} is a scalar or not bound to a run; use .scalar")
        if name not in batch:
            raise InvalidDataError(
                f"the batch lost the field {name!r} that parameter {self.name} reads; keep it on "
                "every system (systems entering from a sampler or another rank must carry it)"
            )
        values = getattr(batch, name)
        if values.dim() == 2:
            values = values.view(-1)
        if values.dtype == dtype:
            return values
        out = self._buffer
        if out is None or out.shape != values.shape or out.device != values.device or out.dtype != dtype:
            # Kept while the number of systems stays: the same tensor object comes back every
            # step (so Warp launches recorded on it are replayed), refilled in place.
            out = self._buffer = torch.empty(values.shape, dtype=dtype, device=values.device)
        out.copy_(values)
        return out

    def __repr__(self) -> str:
        if self.scalar is not None:
            return f"{self.name}={self.scalar:g}"
        if self.field is not None:
            return f"{self.name}=field {self.field!r}"
        return f"{self.name}=tensor[{self.tensor.numel() if self.tensor is not None else '?'}]"

