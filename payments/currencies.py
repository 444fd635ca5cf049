"""The cryptocurrencies checkout accepts, and the amount arithmetic shared by every provider.

Money is computed with Decimal from the shortest text form of each number, so
0.1 BTC stays 0.1 BTC; floats appear only at the JSON edges.
"""

from dataclasses import dataclass
from decimal import ROUND_DOWN, ROUND_UP, Decimal


@dataclass(frozen=True)
class Currency:
    code: str  # our code; the processor's is the lower-case form (btc, usdttrc20)
    name: str
    network: str
    min_usd: float  # our floor; a real processor may demand more (Provider.min_usd)
    decimals: int  # precision of pay amounts
    sandbox_usd: float  # fixed price of one coin on the sandbox chain


CURRENCIES = {
    c.code: c
    for c in (
        Currency("BTC", "Bitcoin", "bitcoin", 10.0, 8, 60_000.0),
        Currency("ETH", "Ether", "ethereum", 5.0, 8, 3_000.0),
        Currency("USDTTRC20", "Tether USD (TRC-20)", "tron", 1.0, 6, 1.0),
        Currency("USDCSOL", "USD Coin (Solana)", "solana", 1.0, 6, 1.0),
        Currency("LTC", "Litecoin", "litecoin", 2.0, 8, 80.0),
    )
}


def dec(value) -> Decimal:
    return Decimal(str(value))


def coins(value: Decimal, currency: Currency, rounding=ROUND_UP) -> Decimal:
    """An amount at the currency's precision; quotes round up so the payer never pays less than the price."""
    return value.quantize(Decimal(1).scaleb(-currency.decimals), rounding=rounding)


def usd_worth(paid, price_usd, pay_amount) -> Decimal:
    """What `paid` coins are worth at the order's quote (price_usd for pay_amount), whatever the market did since."""
    return dec(paid) * dec(price_usd) / dec(pay_amount)


def cents(value: Decimal) -> float:
    return float(value.quantize(Decimal("0.01"), rounding=ROUND_DOWN))


def payment_uri(code: str, address: str, amount) -> str:
    """What a wallet scans: BIP 21 style `network:address?amount=coins`, the form wallets of these networks read."""
    return f"{CURRENCIES[code].network}:{address}?amount={dec(amount).normalize():f}"
