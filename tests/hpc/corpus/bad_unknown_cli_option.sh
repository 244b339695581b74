#!/bin/bash
python job.py
