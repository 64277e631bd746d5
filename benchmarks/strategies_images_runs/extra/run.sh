# The extra runs beside benchmarks/strategies_images: the same backbone trajectories as the
# benchmark's runs (same base config and seed), with alpha1-SLDC's recommended preset as an extra
# track, and (cifar10-lora_seqft-nocurrent) the anchors without the current task's images.
# BENCH: the --out folder of `gdacil bench strategies-images` (its <dataset>.yaml); data as there.
export OMP_NUM_THREADS=1 GDACIL_DATA=${GDACIL_DATA:?} BENCH=${BENCH:?}
TR='{"none":{"name":"identity"},"sldc":{"name":"sldc_linear","defaults":"paper"},"sldc_recommended":{"name":"sldc_linear"},"hopdc":{"name":"hopdc"},"hopdc_paper":{"name":"hopdc","defaults":"paper"}}'
one() { # dataset strategy lr head_lr name overrides...
  n=$1-$2-$5
  python -m gdacil run $BENCH/$1.yaml --resume --set name=$n \
    --set "strategy={\"name\":\"$2\",\"defaults\":\"paper\",\"train\":{\"steps\":30,\"lr\":$3,\"head_lr\":$4,\"augment\":\"auto\"}}" \
    "${@:6}" --set output_dir=$BENCH/extra/$n > $BENCH/extra/$n.log 2>&1
}
mkdir -p $BENCH/extra
(one cifar10 lora_seqft 0.001 0.01 sldcrec --set "compensators=$TR" --set heads='{lr_rgda: {rank: 64}}'
 one cifar10 seqft 0.0005 0.005 sldcrec --set "compensators=$TR" --set heads='{lr_rgda: {rank: 64}}'
 one cifar10 lora_seqft 0.001 0.01 nocurrent --set anchors.include_current=false --set drift_diagnostics=true) &
(one openclipart lora_seqft 0.001 0.01 sldcrec --set "compensators=$TR" --set heads='{lr_rgda: {rank: 64}}'
 one openclipart seqft 0.0005 0.005 sldcrec --set "compensators=$TR" --set heads='{lr_rgda: {rank: 64}}') &
wait
