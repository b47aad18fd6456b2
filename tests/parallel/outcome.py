"""What a call ended with, as a string a rank can return from a spawn and a test can assert on."""


def error_message(fn) -> str:
    """``"ErrorType: message"`` of the exception ``fn()`` raises, or ``"no error"``."""
    try:
        fn()
    except Exception as e:  # the caller asserts the type and message
        return f"{type(e).__name__}: {e}"
    return "no error"
