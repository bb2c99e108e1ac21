"""The monitor's pure policy: rates, backoff, breakers and one loop's decision. No I/O."""
