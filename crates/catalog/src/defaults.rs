//! The built-in data center set used when the configuration names none.
use crate::datacenter::{
    AvailabilityLevel as A, Compliance as C, DataCenter, DataCenterRegion as R, ResourceAvailability, VolumeType as V,
};

fn res(id: &str, name: &str, availability: A) -> ResourceAvailability {
    ResourceAvailability {
        id: id.into(),
        name: name.into(),
        availability,
    }
}

fn dc(id: &str, name: &str, region: R, global_network: bool, tiers: &[V], compliance: &[C]) -> DataCenter {
    DataCenter {
        id: id.into(),
        name: name.into(),
        region,
        global_network,
        network_volume_types: tiers.to_vec(),
        compliance: compliance.to_vec(),
        gpus: Vec::new(),
        cpus: Vec::new(),
    }
}

pub(crate) fn data_centers() -> Vec<DataCenter> {
    let mut list = vec![
        dc(
            "US-KS-2",
            "US Kansas 2",
            R::NorthAmerica,
            true,
            &[V::HighPerformance, V::Standard],
            &[C::SOC_2_TYPE_2, C::ISO_IEC_27001],
        ),
        dc(
            "US-TX-3",
            "US Texas 3",
            R::NorthAmerica,
            true,
            &[V::Standard],
            &[C::SOC_2_TYPE_2],
        ),
        dc(
            "US-CA-2",
            "US California 2",
            R::NorthAmerica,
            false,
            &[V::Standard, V::HighPerformance],
            &[C::SOC_2_TYPE_2, C::HIPAA],
        ),
        dc(
            "CA-MTL-1",
            "Canada Montreal 1",
            R::NorthAmerica,
            true,
            &[V::Standard],
            &[C::RENEWABLE],
        ),
        dc(
            "EU-RO-1",
            "Europe Romania 1",
            R::Europe,
            true,
            &[V::Standard, V::HighPerformance],
            &[C::GDPR, C::ISO_IEC_27001, C::SOC_2_TYPE_2],
        ),
        dc(
            "EU-SE-1",
            "Europe Sweden 1",
            R::Europe,
            false,
            &[V::Standard],
            &[C::GDPR, C::RENEWABLE],
        ),
        dc("EU-CZ-1", "Europe Czechia 1", R::Europe, false, &[], &[C::GDPR]),
        dc(
            "AP-JP-1",
            "Asia Japan 1",
            R::Asia,
            false,
            &[V::Standard],
            &[C::ISO_IEC_27001],
        ),
        dc("OC-AU-1", "Oceania Australia 1", R::Oceania, false, &[V::Standard], &[]),
    ];
    let gpus = [
        res("NVIDIA GeForce RTX 4090", "RTX 4090", A::High),
        res("NVIDIA A100 80GB PCIe", "A100 PCIe", A::Medium),
        res("NVIDIA H100 80GB HBM3", "H100 SXM", A::Low),
    ];
    let cpus = [
        res("cpu3c-2-4", "Compute-Optimized", A::Medium),
        res("cpu3g-4-16", "General Purpose", A::High),
    ];
    for (i, dc) in list.iter_mut().enumerate() {
        // Vary the stock across sites so availability views differ; EU-CZ-1 offers CPUs only.
        if dc.id != "EU-CZ-1" {
            dc.gpus = gpus.iter().skip(i % 2).cloned().collect();
        }
        dc.cpus = cpus.iter().take(1 + i % 2).cloned().collect();
    }
    list
}
