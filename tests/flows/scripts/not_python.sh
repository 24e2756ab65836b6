#!/bin/sh
# Not Python: @torchrun must refuse it before anything starts.
echo "hello from a shell script"
