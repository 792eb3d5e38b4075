"""The reward: passes once celsius_to_fahrenheit adds the offset (run with `python3 test_temperature.py`)."""

from temperature import celsius_to_fahrenheit, fahrenheit_to_celsius

assert celsius_to_fahrenheit(100) == 212, celsius_to_fahrenheit(100)
assert fahrenheit_to_celsius(212) == 100
print("all tests passed")
