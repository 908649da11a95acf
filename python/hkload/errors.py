"""The exceptions hkload raises. Every one derives from :class:`Error`; the ones about a
call's arguments also derive from ``TypeError`` or ``ValueError``, as Python's own do."""


class Error(Exception):
    """Base class of every hkload error."""


class BundleError(Error):
    """The bundle cannot be read: missing, damaged, or modified after ``hkpack build``."""


class NoCodeObjectError(Error):
    """The bundle has no code object that runs on the device; the message explains, module by
    module, which entries it has and why each was passed over (as ``hkpack explain`` does)."""


class UnknownKernelError(Error, AttributeError, LookupError):
    """The bundle has no kernel of that name; the message lists the ones it has."""


class DriverError(Error):
    """The GPU driver is missing, sees no such device, or failed a call."""


class LaunchError(Error):
    """A call was refused before anything reached the GPU."""


class LaunchTypeError(LaunchError, TypeError):
    """An argument of the wrong kind: a tensor of another dtype, a missing argument, a float
    where the kernel takes an integer, an object that is neither tensor nor number."""


class LaunchValueError(LaunchError, ValueError):
    """An argument of the right kind but an unusable value: a buffer shorter than the kernel
    may touch, a tensor on another device or not contiguous, a number out of the declared
    type's range, a broken precondition of the kernel's launch contract."""
