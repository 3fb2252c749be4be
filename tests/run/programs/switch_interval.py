"""Prints the interpreter's switch interval as the program sees it from its first line."""
import sys

print(sys.getswitchinterval())
