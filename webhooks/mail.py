"""Alert emails over SMTP (`SMTP_URL`): smtps:// is TLS from the first byte; smtp:// upgrades with STARTTLS
when the server offers it (`?starttls=require` refuses to go on without it); user and password from the URL.
smtplib runs in a thread, off the event loop; the password is never logged. Nothing is sent while outbound is
held (a restored database: runtime/outbound.py): `send` raises OutboundHeld, which its callers log."""

import asyncio
import smtplib
import ssl
from email.message import EmailMessage
from urllib.parse import parse_qs, unquote, urlsplit

from runtime.outbound import Outbound, OutboundHeld

TIMEOUT = 10.0


class Mailer:
    def __init__(self, url: str, sender: str, outbound: Outbound | None = None):
        self.outbound = outbound or Outbound()
        parts = urlsplit(url)
        self.tls = parts.scheme == "smtps"
        self.host, self.port = parts.hostname or "localhost", parts.port or (465 if self.tls else 25)
        self.user, self.password = unquote(parts.username or ""), unquote(parts.password or "")
        self.require_starttls = parse_qs(parts.query).get("starttls") == ["require"]
        self.sender = sender
        self.context = ssl.create_default_context()

    async def send(self, to: str, subject: str, text: str, attachments: tuple[tuple[str, bytes], ...] = ()) -> None:
        """`attachments`: (file name, PDF bytes) pairs (billing documents)."""
        if self.outbound.held:
            raise OutboundHeld("outbound is held (a restored database)")
        message = EmailMessage()
        message["From"], message["To"], message["Subject"] = self.sender, to, subject
        message.set_content(text)
        for filename, data in attachments:
            message.add_attachment(data, maintype="application", subtype="pdf", filename=filename)
        await asyncio.get_running_loop().run_in_executor(None, self._send, message)

    def _send(self, message: EmailMessage) -> None:
        if self.tls:
            client = smtplib.SMTP_SSL(self.host, self.port, timeout=TIMEOUT, context=self.context)
        else:
            client = smtplib.SMTP(self.host, self.port, timeout=TIMEOUT)
        with client:
            client.ehlo()
            if not self.tls and client.has_extn("starttls"):
                client.starttls(context=self.context)
                client.ehlo()
            elif not self.tls and self.require_starttls:
                raise smtplib.SMTPException("the server does not offer STARTTLS")
            if self.user:
                client.login(self.user, self.password)
            client.send_message(message)
