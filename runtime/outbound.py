"""Whether this process may send anything outward: webhook deliveries, emails (alerts, invitations, password
resets) and the polls of stream rules and monitors. Not while its database is a restored copy whose outbound is
held (storage/markers.py `outbound`: `restore` sets it, `social-gateway release-outbound` lifts it); a restore
drill then never writes to customers' endpoints or inboxes. Read at start (app/context.py) and watched until
released (app/tasks.py); /readyz shows it."""


class OutboundHeld(RuntimeError):
    """An email asked for while outbound is held."""


class Outbound:
    def __init__(self, hold: dict | None = None):
        self.hold = hold  # the marker while held: {reason, since}; None once released (or never held)

    @property
    def held(self) -> bool:
        return self.hold is not None

    @property
    def state(self) -> str:
        return "held" if self.held else "open"
