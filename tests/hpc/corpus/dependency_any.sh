#!/bin/bash
#SBATCH -d afterany:@PARENT@?afternotok:@PARENT@
#SBATCH -t 5
./cleanup.sh
