"""Temperature conversion with one bug for the agent to fix."""


def celsius_to_fahrenheit(c):
    """Return c degrees Celsius in degrees Fahrenheit."""
    return c * 9 / 5


def fahrenheit_to_celsius(f):
    """Return f degrees Fahrenheit in degrees Celsius."""
    return (f - 32) * 5 / 9
